"""The node's part in Slurm: munge's key, slurmd and slurmctld through drop-ins, its report."""
