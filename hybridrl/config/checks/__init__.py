"""Config rules that span several keys, each module beside the feature whose keys it checks.

A rule on one key's own value is declared on its field (`option(check=, choices=)` in schema.py);
a rule that relates keys lives here: `rollout` (sampling, multi-turn, tensor parallelism),
`reward` (custom function, remote scorer, reward model, reward manager), `parallel` (placement,
layouts, sequence parallelism, token budgets), `modes` (trainer.mode, partial rollouts),
`algorithm` (estimators, DAPO, rollout correction, preference losses) and `batch` (the batch sizes
the batch plan splits, with a fix for each problem). Each function takes the
resolved config and returns `Problem`s; `validate.find_problems` runs them all.
"""
