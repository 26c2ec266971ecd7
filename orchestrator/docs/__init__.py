"""The generated pages of docs/: variables, commands, schema."""
