"""Incidents: the one way findings become incidents, incidents change state, and the world hears of it.

- `desk.IncidentDesk`: file a finding (correlated, deduplicated), resolve an incident, announce a report or steps
  waiting for approval. The detection loop, Alertmanager's webhook, the API and the web page all use it.
- `events.IncidentEvent`: what happened, as one value.
- `bus.EventBus`: delivers each event to an explicit list of subscribers, each on its own worker, so a slow
  receiver never delays detection.
- `subscribers`: IM, webhooks, reports, remediation, metrics.
- `correlate.Correlator`: root causes and their echoes.
"""
