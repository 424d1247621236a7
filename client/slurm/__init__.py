"""Slurm jobs as the unit of profiling: `gfxclient profile --job ID` on one
node (profile_job.py) and on every node of the job (all_nodes.py)."""
