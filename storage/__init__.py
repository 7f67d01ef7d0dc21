"""leasefs storage package."""
