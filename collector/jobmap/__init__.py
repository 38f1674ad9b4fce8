"""Job mapping: which processes belong to which Slurm job, from scontrol and over SSH (JobMapper protocol)."""
