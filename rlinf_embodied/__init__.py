"""rlinf-embodied: RL fine-tuning of robot policies in simulators on an M2Flow runtime (Ray).

Importing this package never imports a simulator or a large model.
"""

__version__ = "0.1.0"
