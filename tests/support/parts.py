"""The parts of ``dispatch/`` in their one order (docs/design.md, "Parts and imports"): each part
imports only itself and the parts before it. Held here for the import test and the design
document's table alike."""

PART_ORDER = ("core", "guards", "capping", "local", "agent", "hosts", "placement", "config", "hooks",
              "cli")
