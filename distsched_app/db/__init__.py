"""The only code that knows which database it talks to.

    retry        the one backoff-and-retry helper for transient database errors
"""
