"""The compatibility wing: other frameworks' vocabularies, translated into hybridrl's.

- `verl/`: verl's config keys, its Hydra config files and its command lines
  (`python -m hybridrl.main_ppo | main_dapo | sft_trainer`, docs/verl.md);
- `trl/`: TRL's GRPOTrainer / GRPOConfig names, reward functions, rows and callbacks for the
  Python API (`hybridrl.grpo`, docs/coming_from_trl.md).

The wing imports the core; the core never imports the wing. The edges call it: the CLI and the Python
API, and hybridrl/__init__.py, which installs verl's dialect in the config loader (config/dialect.py).
"""
