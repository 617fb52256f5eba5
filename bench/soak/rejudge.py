"""`python -m bench.soak.rejudge --rejudge FILE.json... [--write]`: re-judge saved soak reports'
RSS by the current rule, each replica past its warm-up (issue 41 item 5;
`bench.soak.report.main`). A module of its own because the `bench.soak` package imports
`bench.soak.report`: run as `-m bench.soak.report`, runpy warned that it ran a module
already imported."""

from bench.soak.report import main

if __name__ == "__main__":
    raise SystemExit(main())
