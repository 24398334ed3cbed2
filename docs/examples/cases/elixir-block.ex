defmodule Shop.Cart do
  @moduledoc "A shopping cart as a map of item => quantity."

  def new, do: %{}

  def add(cart, item, quantity \\ 1) do
    Map.update(cart, item, quantity, &(&1 + quantity))
  end

  def total(cart, prices) do
    ‸
  end
end
