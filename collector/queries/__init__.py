"""What users ask and who they are: the query service, its authentication, and the views it answers with."""
