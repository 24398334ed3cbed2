defmodule Text do
  def word_count(sentence) do
    sentence
    |> String.downcase()
    |> String.split(~r/[^a-z']+/, trim: true)
    |> Enum.frequencies‸
  end
end
