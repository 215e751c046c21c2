-- The analyst's read-only user for a ClickHouse server managed with SQL (access_management = 1),
-- the same as users.d/clawr1-analyst.xml. Replace `clawr1` by the pool database and set a password.
-- The API runs analyst SQL as this user when CLAWR1_SQL_DSN names it:
--   CLAWR1_SQL_DSN=http://clawr1_analyst:<password>@<host>:8123/clawr1
CREATE SETTINGS PROFILE OR REPLACE clawr1_analyst SETTINGS
    readonly = 1 CONST,
    allow_ddl = 0 CONST,
    allow_introspection_functions = 0 CONST,
    result_overflow_mode = 'throw' CONST,
    read_overflow_mode = 'throw' CONST,
    max_block_size = 8192 MIN 1 MAX 65536 CHANGEABLE_IN_READONLY,
    max_execution_time = 30 MIN 1 MAX 30 CHANGEABLE_IN_READONLY,
    max_memory_usage = 2147483648 MIN 1 MAX 2147483648 CHANGEABLE_IN_READONLY,
    max_result_rows = 100000 MIN 1 MAX 100000 CHANGEABLE_IN_READONLY,
    max_result_bytes = 268435456 MIN 1 MAX 268435456 CHANGEABLE_IN_READONLY,
    max_rows_to_read = 2000000000 MIN 1 MAX 2000000000 CHANGEABLE_IN_READONLY,
    output_format_json_quote_64bit_integers = 0 CHANGEABLE_IN_READONLY,
    os_thread_priority = 19 MIN 0 MAX 19 CHANGEABLE_IN_READONLY,
    max_concurrent_queries_for_user = 8;
CREATE USER OR REPLACE clawr1_analyst IDENTIFIED WITH sha256_password BY 'change-me'
    DEFAULT DATABASE clawr1 SETTINGS PROFILE clawr1_analyst;
-- SELECT on the pool database only: no FILE, URL, REMOTE, S3, other SOURCES, dictGet or INTROSPECTION.
GRANT SELECT ON clawr1.* TO clawr1_analyst;
-- The guard reads the function catalogue (harmless: names and descriptions).
GRANT SELECT ON system.functions TO clawr1_analyst;
GRANT SELECT ON system.aggregate_function_combinators TO clawr1_analyst;
