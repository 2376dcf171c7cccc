"""The engine's processes: signals (Ctrl-C, SIGTERM), worker pools that die with their parent, and
answers computed in a forked child."""
