const users = [
  { name: 'Ada', age: 36 },
  { name: 'Alan', age: 41 },
  { name: 'Grace', age: 85 },
];

function namesOlderThan(list, age) {
  return list.filter((user) => user.age > age).map((user) => ‸);
}

console.log(namesOlderThan(users, 40));
