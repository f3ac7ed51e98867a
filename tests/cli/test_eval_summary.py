from hybridrl.cli.main import _eval_summary


def test_gsm8k_summary_reports_strict_and_flexible_side_by_side():
    rows = [
        {"data_source": "openai/gsm8k", "response": "so 70\n#### 72", "ground_truth": "72", "score": 1.0},
        {"data_source": "openai/gsm8k", "response": "the answer is \\boxed{72}", "ground_truth": "72", "score": 0.0},
        {"data_source": "openai/gsm8k", "response": "#### 71", "ground_truth": "72", "score": 0.1},  # format credit
        {"data_source": "openai/gsm8k", "response": "no idea", "ground_truth": "72", "score": 0.0},
        {"data_source": "arith", "response": "5", "ground_truth": "5", "score": 1.0},
    ]
    s = _eval_summary(rows)
    g = s["openai/gsm8k"]
    assert g["n"] == 4 and g["correct"] == 1
    assert abs(g["accuracy"] - 1.1 / 4) < 1e-12
    assert g["flexible_accuracy"] == 0.5  # "#### 72" and "\boxed{72}" end in the right number
    assert [r["score_flexible"] for r in rows[:4]] == [1.0, 1.0, 0.0, 0.0]
    assert s["arith"] == {"n": 1, "accuracy": 1.0, "correct": 1} and "score_flexible" not in rows[4]
