"""The small async LLM protocol of the core, structured output from model text, and the
registry through which framework adapters wrap their models."""
