"""leasefs mount package."""
