from .sweep import main

raise SystemExit(main())
