"""This node's engines as transient systemd units: started, probed, restarted and adopted.

lifecycle.Replicas keeps the desired set and supervises each replica's unit; the rest is
plain: admission (a spec checked once, as it enters), unit_properties (the unit's name,
command line and properties), health (what an engine says over HTTP), records and
key_files (what the agent keeps on disk), ports (an engine's port).
"""

from llmgw_agentd.replicas.health import health_code
from llmgw_agentd.replicas.lifecycle import CommandBuilder, Preparer, Replicas
from llmgw_agentd.replicas.records import EngineRecord

__all__ = ["CommandBuilder", "EngineRecord", "Preparer", "Replicas", "health_code"]
