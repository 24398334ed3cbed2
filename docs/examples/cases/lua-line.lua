local function sum(list)
  local total = 0
  for _, value in ipairs(list) do
    total = total + ‸
  end
  return total
end

print(sum({ 1, 2, 3, 4 }))
