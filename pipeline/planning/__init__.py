"""Planning: memory/throughput model, parallelism placement, resources, host fit, AIConfigurator."""
