"""The contract on disk: the session directory and its records.

``paths`` (the name of every file of a session directory, its parser, and
who writes and reads it; pure), ``records`` (the typed, versioned records),
``session_dir`` (every read and write of a session directory),
``generations`` (the generation commit of ``allocation.json``),
``recovery`` (whether a damaged record can be restored, pure) and
``allocation_repair`` (restoring it), ``head_agent`` (where to reach the agent
that serves a head, read from its files).
"""
