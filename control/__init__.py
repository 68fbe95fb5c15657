"""The control plane: the Ray Jobs SDK client, the SSH node manager and the node state machine.

Remediation acts through it and the API exposes it; it speaks HTTP to nothing itself.
"""
