"""The SDK's release: ax's own (the workspace's Cargo.toml), read by pyproject.toml and sent in Register."""

__version__ = "0.2.0"
