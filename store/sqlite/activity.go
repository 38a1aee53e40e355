package sqlite

// minuteSince is the whole minutes from its argument to a row's created_at
// (INTEGER microseconds): an integer division, exact for the rows at or
// after the argument that an activity read counts.
const minuteSince = `((created_at - ?) / 60000000)`
