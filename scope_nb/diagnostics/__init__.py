"""The paper's theory computed exactly on small games, and the collapse diagnostics measured on runs."""
