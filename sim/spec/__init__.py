"""The scenario schema: YAML and overrides in, a validated frozen ``Scenario`` out, with its rules."""
