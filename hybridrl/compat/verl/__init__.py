"""verl's vocabulary: config keys (`keys`), Hydra config files (`hydra`), command lines (`argv`), and the
dialect the config loader reads them through (`dialect`)."""
