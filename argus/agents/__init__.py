"""Argus on every node: node agents as Ray actors (node_agent.py, scanner.py), the fleet job that keeps one on every
ALIVE node (fleet.py) and the central's inbox for what they send (inbox.py); see each module."""
