"""Long Range Arena data: generators (ListOps, Pathfinder / Path-X) and readers for the public data sets."""
