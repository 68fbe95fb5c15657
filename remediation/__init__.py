"""Remediation: guarded, idempotent, audited actions (keep_scene, drain_node, resubmit_job, stop_job)
planned from incidents by policy (off, dry-run, approval, auto)."""
