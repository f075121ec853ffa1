"""`gpu-spatial`: the one command for people (the exporter, `top`, `report`, the nsys tools)."""
