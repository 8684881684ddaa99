"""`deploy=ray`: replicas of the whole pipeline behind one OpenAI API on Ray Serve
(docs/deploy.md). Only `launch.py` and `replica.py` import Ray; the rest of omniflow never
does, so Ray stays an optional extra (`pip install omniflow[ray]`)."""
