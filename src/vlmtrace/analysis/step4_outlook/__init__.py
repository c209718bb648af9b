"""Step 4, the outlook: requests until a device runs out, what releasing cached memory costs, and what
to change in LMDeploy or PyTorch settings."""
