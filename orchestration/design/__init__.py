"""The sweep's design: its file (spec, schema), axes and units, the plan, and the checks before anything runs
(preflight, resources, packing). Torch-free."""
