package mysql

// minuteSince is the whole minutes from its argument to a row's created_at
// (DATETIME(6)): TIMESTAMPDIFF counts complete minutes, microseconds
// included, in MySQL 8.4 and MariaDB 10.11 alike.
const minuteSince = `TIMESTAMPDIFF(MINUTE, ?, created_at)`
