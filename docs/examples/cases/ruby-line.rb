def palindrome?(word)
  letters = word.downcase.gsub(/[^a-z]/, '')
  letters == ‸
end

puts palindrome?('A man, a plan, a canal: Panama')
