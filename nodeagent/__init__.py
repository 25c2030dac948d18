"""gpupool-agent: the node agent. Imports nothing from Django or the portal."""
