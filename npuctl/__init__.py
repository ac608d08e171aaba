"""``npuctl``: the npuportal command line — submit, queue, cancel, show, quota, nodes, usage, policy.

Standard library only (argparse, urllib, json), so it runs on any laptop with
Python 3.11+: copy the folder or ``pip install`` the project. It talks to the
REST API at ``$NPUPORTAL_URL`` with ``$NPUPORTAL_TOKEN``.
"""

__version__ = "0.1.0"
