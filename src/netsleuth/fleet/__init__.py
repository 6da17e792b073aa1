"""The fleet: agents on many hosts, driven over NATS JetStream by one controller (issue 9).

`protocol` is the wire format both sides share; `agent_link` is the agent's side of it.
"""
