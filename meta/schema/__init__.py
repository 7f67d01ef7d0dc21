"""The metadata server's ground floor: the store's key schema and the records kept under
it; it imports nothing else of meta."""
