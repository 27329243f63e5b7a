from llama_sparse.cli import main

raise SystemExit(main())
