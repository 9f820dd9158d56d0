"""The runtime logic of tray, free of I/O (see docs/architecture.md, "The rule").

The core knows nothing above it: the public API (``tray/api``) drives it,
and backends (``tray/backends``) register with the API by name, so the core
never imports one."""
