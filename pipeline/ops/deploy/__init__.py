"""Deployments on clusters: Kubernetes (Deployment / LeaderWorkerSet, Indexed Job) and Slurm (sbatch, job array)."""
