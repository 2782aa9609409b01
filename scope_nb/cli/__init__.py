"""The `scope` command and `scope info`."""
