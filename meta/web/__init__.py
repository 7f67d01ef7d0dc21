"""The metadata server's web UI: the ASGI app, what each page shows, and the start-up pages;
templates/ holds the pages.
"""
