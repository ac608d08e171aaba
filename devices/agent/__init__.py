"""npuportal node agent: reports accelerators and runs jobs on one Ascend (or NVIDIA) node.

It runs on every accelerator node, next to nothing but Python and the vendor tool, which is why this
package imports only the standard library. ``python -m devices.agent --help`` starts it; the parsers are
usable on their own (``devices.agent.npusmi``, ``devices.agent.nvsmi``). See README.md beside this file.
"""

AGENT_VERSION = "1"
