"""Running one admitted job on this machine: the front door, the spawn, the watch, the judgement,
and the guards around it (preflight, signals, the guardian)."""
