"""The only code that knows which database it talks to.

Nothing outside this package reads ``connection.vendor`` or ``connection.features``.

    bulk         insert rows and update from rows (PostgreSQL arrays bound on the server,
                 elsewhere chunked VALUES lists), columns and types from the models
    locks        skip-locked and row-locked selects, a no-op on SQLite (BEGIN IMMEDIATE)
    expressions  SQL functions with a SQLite branch (Microseconds, UTCHour)
    server       what only some servers tell: their clock, a row estimate, costly counts;
                 the database named for a log line (no credentials)
    retry        the one backoff-and-retry helper for transient database errors
    admission    a claim's partition lock, bounded wait and count after it (and the overrides) in one round trip
    holds        a release's delete of limit holds with its probe of blocked runs (one statement on PostgreSQL)
    indexes      an index with an explicit NULLs order, spelled for each database
"""
