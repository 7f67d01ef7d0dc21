"""leasefs tools package."""
