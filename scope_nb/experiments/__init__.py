"""The paper's experiments as registered configs, their runner, reports, measurements and pre-registered tests."""
