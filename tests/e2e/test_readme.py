"""The README's first screen: what hybridrl is, the two commands CI and users run (exactly .ci/run's test
command), console lines the quickstart really prints, the report command with a picture, and the links
every newcomer looks for; every relative link of the README points at a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = README.split("\n## ", 1)[0]


def test_the_first_screen_fits_one_screen_and_holds_the_two_commands():
    assert len(FIRST_SCREEN.splitlines()) <= 45
    ci = (ROOT / ".ci/run").read_text()
    test_command = 'pip install torch==2.13.0 -e ".[test]" && bash tests/run.sh'
    assert test_command in FIRST_SCREEN and test_command in ci  # CI runs the README's test command verbatim
    assert "pip install torch==2.13.0 -e . && hybridrl train configs/quickstart.yaml" in FIRST_SCREEN
    assert "hybridrl report runs/quickstart/arith_grpo --out report.html" in FIRST_SCREEN
    assert re.search(r"!\[[^\]]*\]\(docs/img/\w+\.png\)", FIRST_SCREEN)
    for name in ("docs/coming_from_trl.md", "docs/verl.md", "docs/distributed.md", "docs/algorithms.md", "docs/agents.md"):
        assert f"]({name})" in FIRST_SCREEN, name
    assert "docs/reward_models.md" in FIRST_SCREEN and "BENCHMARKS.md#" in FIRST_SCREEN  # reward models, scaling


def test_the_console_lines_are_in_the_shape_the_trainer_prints():
    block = re.search(r"```\n(\[hybridrl .*?)```", FIRST_SCREEN, re.S).group(1).splitlines()
    assert 6 <= len(block) <= 10
    steps = [line for line in block if line.startswith("step ")]
    assert steps and all(re.match(r"step \d+/300 \| (critic/score/mean|val-core)", s) for s in steps)
    assert any(line.startswith("[hybridrl] run finished: step 300/300") for line in block)


def test_every_relative_link_points_at_a_file():
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_every_benchmarks_anchor_exists():
    headings = (ROOT / "BENCHMARKS.md").read_text()
    anchors = set()
    for h in re.findall(r"^#+ (.+)$", headings, re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-"))
    for anchor in re.findall(r"BENCHMARKS\.md#([\w\-]+)", README):
        assert anchor in anchors, anchor
