"""Operations on finished builds: release archives, their verification, cluster deployments."""
