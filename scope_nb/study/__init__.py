"""The human study: its store, participant sessions, the web app and the pre-registered analysis."""
