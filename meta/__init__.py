"""leasefs meta package."""
