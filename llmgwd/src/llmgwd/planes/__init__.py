"""Control planes: leadership, standbys, joining, migrating, and etcd's own members."""
